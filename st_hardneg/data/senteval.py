"""Data: the unsupervised training corpus and the SentEval evaluation directory.

Where the SentEval directory is looked for (first hit wins), see :func:`resolve_senteval_dir`:

1. the ``data_dir`` argument / ``--data-dir`` option;
2. the ``ST_HARDNEG_DATA`` environment variable (the one data variable of the library, the tests and the benchmarks;
   the old ``ST_HARDNEG_SHARED_DATA`` is still read, with a ``DeprecationWarning``);
3. ``../shared/data`` and ``./data`` relative to the working directory;
4. ``~/.cache/st_hardneg/data`` (where :func:`download_senteval` puts it).

Each may be the SentEval ``downstream`` directory itself (it contains ``STS/``, ``SICK/``, ``MR/`` …) or its
parent (containing ``senteval/``). Nothing here is ever bundled with the package: users with a network fetch the
originals with :func:`download_senteval` / :func:`download_wiki1m` (``st-hardneg download``).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.getLogger(__name__)

ENV_DATA_DIR = "ST_HARDNEG_DATA"
#: the old name of :data:`ENV_DATA_DIR` (the tests' and benchmarks' until 0.3): read when the new one is unset
DEPRECATED_ENV_DATA_DIR = "ST_HARDNEG_SHARED_DATA"
CACHE_DIR = Path(os.environ.get("ST_HARDNEG_CACHE", Path.home() / ".cache" / "st_hardneg"))

#: the SimCSE authors' packaging of SentEval's downstream data (STS12-16, STS-B, SICK and the transfer tasks)
SENTEVAL_URL = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/senteval.tar"
#: the 10^6 Wikipedia sentences that SimCSE, MixCSE, HNCSE, AdCSE and Focal-InfoNCE train on
WIKI1M_URL = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/wiki1m_for_simcse.txt"

#: subsets of each STS year, as in SentEval (STS13 has no SMT: it is licence-restricted)
STS_YEAR_SUBSETS: dict[str, tuple[str, ...]] = {
    "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
    "STS13": ("FNWN", "headlines", "OnWN"),
    "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
    "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
    "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
STS_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness")
#: extra task names accepted by the STS evaluation (model selection, never reported as a test score)
STS_DEV_TASKS = ("STSBenchmark-dev",)


class DataNotFoundError(FileNotFoundError):
    """Raised when evaluation data is missing; the message lists the missing files and how to get them."""


def _how_to_get() -> str:
    return (
        "Get the SentEval data with `st-hardneg download senteval --dest DIR` (needs a network; it fetches "
        f"{SENTEVAL_URL}) and pass --data-dir DIR, or set {ENV_DATA_DIR}=DIR. DIR may be the SentEval "
        "'downstream' folder (containing STS/ and SICK/) or its parent (containing senteval/)."
    )


def _as_senteval_root(path: Path) -> Path | None:
    if (path / "senteval").is_dir():
        return path / "senteval"
    if (path / "STS").is_dir() or (path / "SICK").is_dir() or (path / "MR").is_dir():
        return path
    return None


def data_dir_from_env() -> str | None:
    """The data folder named by ``$ST_HARDNEG_DATA`` (or, deprecated, ``$ST_HARDNEG_SHARED_DATA``, with a
    ``DeprecationWarning``); ``None`` when neither is set."""
    value = os.environ.get(ENV_DATA_DIR)
    if value:
        return value
    old = os.environ.get(DEPRECATED_ENV_DATA_DIR)
    if old:
        import warnings

        warnings.warn(f"${DEPRECATED_ENV_DATA_DIR} is deprecated: set ${ENV_DATA_DIR} to the same folder",
                      DeprecationWarning, stacklevel=2)
        return old
    return None


def resolve_senteval_dir(data_dir: str | Path | None = None) -> Path:
    """The SentEval ``downstream`` directory, found as described in the module docstring.

    Raises:
        DataNotFoundError: an explicit ``data_dir`` (or ``$ST_HARDNEG_DATA``) holds no SentEval data, or none of
            the default places does; the message says how to get it.
    """
    explicit = data_dir if data_dir is not None else data_dir_from_env()
    if explicit:
        path = Path(explicit).expanduser()
        root = _as_senteval_root(path) if path.is_dir() else None
        if root is None:
            source = "data_dir" if data_dir is not None else f"${ENV_DATA_DIR}"
            raise DataNotFoundError(
                f"{source}={str(path)!r} contains no SentEval data (expected STS/, SICK/ … or senteval/). "
                + _how_to_get()
            )
        return root
    searched = [Path.cwd() / ".." / "shared" / "data", Path.cwd() / "data", CACHE_DIR / "data"]
    for candidate in searched:
        root = _as_senteval_root(candidate) if candidate.is_dir() else None
        if root is not None:
            return root.resolve()
    raise DataNotFoundError(
        "No SentEval data directory given and none found in " + ", ".join(str(p) for p in searched) + ". "
        + _how_to_get()
    )


def sts_files(task: str) -> list[str]:
    """Relative paths (under the SentEval root) of the files one STS task reads."""
    if task in STS_YEAR_SUBSETS:
        folder = f"STS/{task}-en-test"
        return [f"{folder}/STS.{kind}.{name}.txt" for name in STS_YEAR_SUBSETS[task] for kind in ("input", "gs")]
    if task == "STSBenchmark":
        return ["STS/STSBenchmark/sts-test.csv"]
    if task == "STSBenchmark-dev":
        return ["STS/STSBenchmark/sts-dev.csv"]
    if task == "SICKRelatedness":
        return ["SICK/SICK_test_annotated.txt"]
    raise ValueError(f"unknown STS task {task!r}; choose from {', '.join(STS_TASKS + STS_DEV_TASKS)}")


def check_sts_data(root: Path, tasks: Iterable[str]) -> None:
    """Raise :class:`DataNotFoundError` naming every missing file of ``tasks`` under ``root``."""
    folders = [rel for task in tasks for rel in sts_files(task) if (root / rel).is_dir()]
    if folders:
        raise DataNotFoundError(f"{root / folders[0]} is a folder, not the SentEval file it should be")
    missing = [rel for task in tasks for rel in sts_files(task) if not (root / rel).is_file()]
    if missing:
        shown = "\n  ".join(missing[:20]) + ("\n  …" if len(missing) > 20 else "")
        raise DataNotFoundError(f"Missing SentEval files under {root}:\n  {shown}\n" + _how_to_get())


def _whitespace(text: str) -> str:
    # SentEval splits sentences on whitespace and the SimCSE batcher joins them with single spaces.
    return " ".join(text.split())


class DataFormatError(ValueError):
    """A data file that cannot be read as its format says: the message names the file and the line."""


def read_text_lines(path: str | Path, what: str = "file", allow_empty: bool = False) -> list[str]:
    """The lines of a UTF-8 text file, refusing what would otherwise be read wrongly without a word.

    Raises:
        DataFormatError: the file is empty (no non-blank line), binary (contains a NUL byte) or not UTF-8; the
            message names the file and, for binary or undecodable content, the line.
    """
    path = Path(path)
    data = path.read_bytes()
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data[:nul].count(b"\n") + 1
        raise DataFormatError(f"{path}, line {line}: binary content (a NUL byte); expected a UTF-8 text {what}")
    try:
        text = data.decode("utf8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataFormatError(f"{path}, line {line}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    lines = text.splitlines()
    if not allow_empty and not any(line.strip() for line in lines):
        raise DataFormatError(f"{path} is empty: expected a {what}")
    return lines


#: the gold-score scale of each STS source: STS12-16 and STS-B are 0-5, SICK relatedness 1-5
STS_SCORE_RANGE = (0.0, 5.0)
SICK_SCORE_RANGE = (1.0, 5.0)


def _score(path: Path, number: int, raw: str, scale: tuple[float, float] = STS_SCORE_RANGE) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise DataFormatError(f"{path}, line {number}: the gold score {raw.strip()!r} is not a number") from None
    if not math.isfinite(value):
        raise DataFormatError(f"{path}, line {number}: the gold score {raw.strip()!r} is not finite")
    low, high = scale
    if not low <= value <= high:
        raise DataFormatError(f"{path}, line {number}: the gold score {raw.strip()!r} is outside the task's scale "
                              f"[{low:g}, {high:g}]")
    return value


def _read_scored_rows(path: Path, rows: Iterable[tuple[int, str]], layout: str, columns: tuple[int, int, int],
                      s1: list[str], s2: list[str], gold: list[float], allowed: tuple[int, ...],
                      scale: tuple[float, float]) -> None:
    """Append the (score, sentence 1, sentence 2) ``columns`` of every non-blank ``(line number, line)`` of a
    tab-separated file with the fields of ``layout`` (``allowed``: the field counts a line may have) to ``gold``,
    ``s1`` and ``s2``; every score must lie in ``scale``."""
    needed = len(layout.split(", "))
    score, first, second = columns
    for number, line in rows:
        if not line.strip():
            continue
        fields = _fields(path, number, line, needed, layout, allowed)
        gold.append(_score(path, number, fields[score], scale))
        s1.append(_whitespace(fields[first]))
        s2.append(_whitespace(fields[second]))


def _fields(path: Path, number: int, line: str, needed: int, layout: str,
            allowed: tuple[int, ...] | None = None) -> list[str]:
    """The tab-separated fields of one line: at least ``needed``, and (``allowed``) exactly one of those counts.

    A line with more fields than its format has is refused rather than cut: an extra tab inside a sentence would
    otherwise silently drop the end of the sentence (or shift the score)."""
    fields = line.split("\t")
    if len(fields) < needed:
        raise DataFormatError(
            f"{path}, line {number}: {len(fields)} tab-separated field(s), expected at least {needed} ({layout}); "
            "the file is truncated or not tab-separated"
        )
    allowed = allowed if allowed is not None else (needed,)
    if len(fields) not in allowed:
        expected = " or ".join(str(count) for count in allowed)
        raise DataFormatError(
            f"{path}, line {number}: {len(fields)} tab-separated fields, expected {expected} ({layout}); an extra tab "
            "(inside a sentence?) would cut a sentence or shift the score"
        )
    return fields


def read_sts_pairs(root: str | Path, task: str) -> tuple[list[str], list[str], list[float]]:
    """Scored sentence pairs of one STS task, as SentEval reads them.

    STS12–16 pool every scored pair of all subsets of the year (SimCSE's "all" setting); lines whose gold
    score is empty are unscored and skipped. STS-B reads ``sts-test.csv`` (``sts-dev.csv`` for
    ``"STSBenchmark-dev"``): score in column 5, sentences in columns 6 and 7. SICK-R reads the test file.

    Every line is checked, so a damaged file is never scored on a silently smaller set of pairs: an input file
    and its gold file must have the same number of lines, every input line holds exactly two tab-separated
    sentences and every gold line one score, every STS-B line seven fields (or nine: some lines of the original
    files carry two source fields) and every SICK line four or five (the entailment label), and every gold score
    must be a finite number on the task's scale (0-5; SICK 1-5). A line with a field too many is an error, not cut.

    Returns:
        (sentences1, sentences2, gold scores)

    Raises:
        DataNotFoundError: a file of the task is missing.
        DataFormatError: an empty, binary or non-UTF-8 file, a line with too few or too many fields, a non-numeric,
            non-finite or out-of-scale score, or input and gold files of different lengths; the message names the
            file and the line.
    """
    root = Path(root)
    check_sts_data(root, [task])
    s1: list[str] = []
    s2: list[str] = []
    gold: list[float] = []
    if task in STS_YEAR_SUBSETS:
        folder = root / "STS" / f"{task}-en-test"
        for name in STS_YEAR_SUBSETS[task]:
            input_path, gold_path = folder / f"STS.input.{name}.txt", folder / f"STS.gs.{name}.txt"
            inputs = read_text_lines(input_path, "file of sentence pairs")
            scores = read_text_lines(gold_path, "gold score file")
            if len(inputs) != len(scores):
                shorter = input_path if len(inputs) < len(scores) else gold_path
                raise DataFormatError(
                    f"{input_path} has {len(inputs)} lines but {gold_path} has {len(scores)}: one line per pair in "
                    f"both; {shorter} ends early at line {min(len(inputs), len(scores))}"
                )
            for number, (line, score) in enumerate(zip(inputs, scores, strict=True), start=1):
                a, b = _fields(input_path, number, line, 2, "sentence 1, sentence 2")
                if not score.strip():
                    continue
                _fields(gold_path, number, score, 1, "gold score")
                value = _score(gold_path, number, score)
                s1.append(_whitespace(a))
                s2.append(_whitespace(b))
                gold.append(value)
    elif task in ("STSBenchmark", "STSBenchmark-dev"):
        split = "test" if task == "STSBenchmark" else "dev"
        path = root / "STS" / "STSBenchmark" / f"sts-{split}.csv"
        rows = enumerate(read_text_lines(path, "STS-B file"), start=1)
        _read_scored_rows(path, rows, "genre, file, year, id, score, sentence 1, sentence 2", (4, 5, 6), s1, s2, gold,
                          allowed=(7, 9), scale=STS_SCORE_RANGE)
    elif task == "SICKRelatedness":
        path = root / "SICK" / "SICK_test_annotated.txt"
        rows = enumerate(read_text_lines(path, "SICK file")[1:], start=2)
        _read_scored_rows(path, rows, "pair id, sentence A, sentence B, relatedness score", (3, 1, 2), s1, s2, gold,
                          allowed=(4, 5), scale=SICK_SCORE_RANGE)
        if not gold:
            raise DataFormatError(f"{path} has a header but no sentence pairs")
    else:
        sts_files(task)  # raises the "unknown task" error
    if not gold:
        raise DataFormatError(f"{task}: no scored sentence pairs under {root}")
    return s1, s2, gold


def read_corpus(path: str | Path, min_chars: int = 0, dedupe: bool = False) -> list[str]:
    """Sentences of a SimCSE-style corpus file (one sentence per line; blank lines dropped).

    Args:
        path: the text file, e.g. ``wiki1m_for_simcse.txt``.
        min_chars: drop lines shorter than this after stripping (0 keeps every non-empty line, as SimCSE does).
        dedupe: drop repeated lines, keeping the first occurrence (SimCSE keeps them; duplicates in a batch are
            false negatives, see ``BatchSamplers.NO_DUPLICATES``).
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"corpus file {str(path)!r} is a folder, not a file; pass a text file with one "
                                "sentence per line")
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus file {str(path)!r} not found. Pass a text file with one sentence per line; the papers' corpus "
            f"can be fetched with `st-hardneg download wiki1m --dest DIR` ({WIKI1M_URL})."
        )
    sentences = [line.strip() for line in read_text_lines(path, "corpus file", allow_empty=True)]
    sentences = [s for s in sentences if s and len(s) >= min_chars]
    if dedupe:
        sentences = list(dict.fromkeys(sentences))
    if not sentences:
        raise ValueError(f"corpus file {str(path)!r} contains no sentences")
    return sentences


def check_texts(texts: object, name: str = "sentences", allow_empty_list: bool = False) -> list[str]:
    """``texts`` as a list, if it is a sequence (list, tuple …, not a string) of non-empty strings.

    A string is refused rather than split into its characters, ``None``, numbers and other objects rather than
    converted to their ``repr``, and empty or blank strings rather than trained on as "".

    Args:
        texts: the texts.
        name: the argument's name in the messages.
        allow_empty_list: accept an empty sequence (else ``ValueError``).

    Raises:
        TypeError: ``texts`` is a string, bytes or not a sequence, or one of its items is not a string (the message
            names the argument and the index).
        ValueError: an empty or blank string (naming the index), or no text at all.
    """
    if isinstance(texts, str | bytes):
        raise TypeError(f"{name} must be a list of strings, got a {type(texts).__name__} ({texts[:40]!r}); a single "
                        f"text would be read as its characters: pass [{texts[:40]!r}]")
    if isinstance(texts, Mapping) or not isinstance(texts, Iterable):
        raise TypeError(f"{name} must be a list of strings, got {type(texts).__name__}")
    items = list(texts)
    for index, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{index}] is {text!r} ({type(text).__name__}); every text must be a non-empty "
                            "string")
        if not text.strip():
            raise ValueError(f"{name}[{index}] is an empty string ({text!r}); every text must be a non-empty string")
    if not items and not allow_empty_list:
        raise ValueError(f"{name} is empty: no text")
    return items


def pair_dataset(sentences: list[str] | Dataset, column: str | None = None) -> Dataset:
    """A ``datasets.Dataset`` with columns ``anchor`` and ``positive`` holding the same sentence (unsupervised SimCSE).

    Args:
        sentences: a list (or other sequence) of non-empty strings, or a ``datasets.Dataset`` with one text column.
        column: the text column of a Dataset (default: its only string column).

    Raises:
        TypeError: ``sentences`` is a single string or not a sequence, or an item is not a string (``None``, a
            number …); the message names the index (see :func:`check_texts`).
        ValueError: no sentences, or an empty / blank one.
    """
    from datasets import Dataset

    if isinstance(sentences, Dataset):
        if column is None:
            text_columns = [c for c, f in sentences.features.items() if getattr(f, "dtype", None) in ("string",
                                                                                                      "large_string")]
            if len(text_columns) != 1:
                raise ValueError(f"pass column=...; the dataset has text columns {text_columns}")
            column = text_columns[0]
        texts = check_texts(sentences[column], f"sentences[{column!r}]", allow_empty_list=True)
    else:
        texts = check_texts(sentences, "sentences", allow_empty_list=True)
    if not texts:
        raise ValueError("no sentences to train on")
    return Dataset.from_dict({"anchor": texts, "positive": texts})


class DownloadError(OSError):
    """A download that could not happen: the message names the URL and the cause (no network, ``HF_HUB_OFFLINE``)."""


def _download(url: str, dest: Path, desc: str) -> Path:
    """Stream ``url`` to ``dest`` with a progress bar; the file appears only when complete.

    Raises:
        DownloadError: ``HF_HUB_OFFLINE`` is set (for a Hugging Face URL), or the URL cannot be reached: names the
            URL, the cause, and where to put the file by hand.
    """
    import urllib.error

    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no", "off")
    if offline and "huggingface.co" in url:
        raise DownloadError(f"cannot download {url}: HF_HUB_OFFLINE is set. Unset it, or fetch the file on a machine "
                            f"with a network and place it at {dest}")
    where = f"Fetch it on a machine with a network and place it at {dest}"
    try:
        return _stream(url, dest, desc)
    except urllib.error.HTTPError as exc:
        raise DownloadError(f"cannot download {url}: HTTP {exc.code} {exc.reason}. {where}") from None
    except urllib.error.URLError as exc:
        reason = str(exc.reason)
        unresolved = ("Name or service not known", "nodename nor servname", "Temporary failure in name resolution")
        cause = "no network (the host name does not resolve)" if any(text in reason for text in unresolved) else reason
        raise DownloadError(f"cannot download {url}: {cause}. {where}") from None
    except TimeoutError:
        raise DownloadError(f"cannot download {url}: no answer within 60 s. {where}") from None


def _stream(url: str, dest: Path, desc: str) -> Path:
    """Stream ``url`` to ``dest`` with a progress bar; the file appears only when complete."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkstemp(dir=dest.parent, prefix=dest.name, suffix=".part")[1])
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=desc) as bar:
                for chunk in iter(lambda: response.read(1 << 20), b""):
                    out.write(chunk)
                    bar.update(len(chunk))
        tmp.replace(dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


def download_senteval(dest: str | Path | None = None, url: str = SENTEVAL_URL) -> Path:
    """Download and unpack SentEval's downstream data (SimCSE's ``senteval.tar``) to ``dest/senteval``.

    Returns the SentEval root, usable as ``data_dir``. Needs a network connection.
    """
    dest = Path(dest) if dest is not None else CACHE_DIR / "data"
    root = dest / "senteval"
    if _as_senteval_root(dest) is not None and (root / "STS").is_dir():
        logger.info("SentEval data already present in %s", root)
        return root
    archive = _download(url, dest / "senteval.tar", "senteval.tar")
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    archive.unlink()
    # Some copies of the archive wrap everything in one more folder.
    inner = [p for p in root.iterdir() if p.is_dir()]
    if not (root / "STS").is_dir() and len(inner) == 1 and (inner[0] / "STS").is_dir():
        for item in inner[0].iterdir():
            shutil.move(str(item), root / item.name)
        inner[0].rmdir()
    return root


def download_wiki1m(dest: str | Path | None = None, url: str = WIKI1M_URL) -> Path:
    """Download ``wiki1m_for_simcse.txt`` (about 120 MB) to ``dest``; returns the file path."""
    dest = Path(dest) if dest is not None else CACHE_DIR / "data"
    target = dest / "wiki1m_for_simcse.txt"
    if target.is_file():
        return target
    return _download(url, target, target.name)
