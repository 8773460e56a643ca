"""Data: every file reader of st-hardneg, torch-free.

- :mod:`~st_hardneg.data.senteval`: SentEval STS files, training corpora, the data directory, downloads;
- :mod:`~st_hardneg.data.transfer`: the 7 SentEval transfer tasks;
- :mod:`~st_hardneg.data.mrpc`: the MRPC paraphrase-retrieval task and its dev split;
- :mod:`~st_hardneg.data.mining`: hard-negative mining with an on-disk cache.

The names of :mod:`~st_hardneg.data.senteval` are available here too:

>>> from st_hardneg.data import read_corpus, read_sts_pairs, resolve_senteval_dir
"""

from st_hardneg.data.senteval import (
    CACHE_DIR,
    ENV_DATA_DIR,
    SENTEVAL_URL,
    STS_DEV_TASKS,
    STS_TASKS,
    STS_YEAR_SUBSETS,
    WIKI1M_URL,
    DataFormatError,
    DataNotFoundError,
    check_sts_data,
    check_texts,
    download_senteval,
    download_wiki1m,
    pair_dataset,
    read_corpus,
    read_sts_pairs,
    read_text_lines,
    resolve_senteval_dir,
    sts_files,
)

__all__ = [
    "CACHE_DIR", "ENV_DATA_DIR", "SENTEVAL_URL", "STS_DEV_TASKS", "STS_TASKS", "STS_YEAR_SUBSETS", "WIKI1M_URL",
    "DataFormatError", "DataNotFoundError", "check_sts_data", "check_texts", "download_senteval", "download_wiki1m",
    "pair_dataset", "read_corpus", "read_sts_pairs", "read_text_lines", "resolve_senteval_dir", "sts_files",
]
