"""Engines: where prediction rows are folded into bucket partials for a scan of a Parquet dataset.

`local` folds the dataset chunk by chunk in this process; `dask` folds it per partition on a Dask
cluster and gathers only the serialized partials. Both run the same chunk function
(`local.chunk_partials`) and store through the same merge (`local.store_partials`), so the windows
scored from their partials (`monitor.verdicts.windows.score`) give the same findings. docs/scale.md says
which to use when.
"""

from monitor.daemon.engines.local import (
    ChunkResult,
    Scan,
    ScanResult,
    chunk_partials,
    merge_rows,
    store_partials,
)

__all__ = ["ChunkResult", "Scan", "ScanResult", "chunk_partials", "merge_rows", "store_partials"]
