"""Sources: read new rows incrementally from a growing directory of files or from a SQL table.

Each read yields `Batch`es of at most `limits.chunk_rows` rows (memory stays bounded whatever the
backlog) together with the offset state that marks them consumed. The caller commits a batch's results
and its offsets in one transaction, so a restart reads every row exactly once.

The readers live in `files` (a directory of files, with `identity`, `chunks`, `jsonl`, `csvlines` and `tables`)
and `sql` (a table); `batch` holds what they yield.
"""

from __future__ import annotations

from monitor.config import FileSource, Limits, SqlSource
from monitor.ingest.sources.files import DirectorySource
from monitor.ingest.sources.sql import SqlTableSource


def open_source(name: str, config: FileSource | SqlSource, limits: Limits) -> DirectorySource | SqlTableSource:
    """The reader for a configured source."""
    return DirectorySource(name, config, limits) if config.kind == "files" else SqlTableSource(name, config, limits)
