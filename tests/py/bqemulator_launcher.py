"""Starts bqemulator (PyPI `bqemulator` 1.4.0) for the tests, with two patches.

1. bqemulator downloads DuckDB's `spatial` extension at start and exits when it cannot (no network
   beyond the package registries here). Skipping it leaves GEOGRAPHY unsupported; everything else
   works.
2. Its Storage Write API builds the target table's Arrow schema from each column's name, type and
   mode only, dropping a RECORD's fields, so every append to a table with a RECORD column fails
   in DuckDB ("Cannot cast STRUCTs of different size"). Its own REST path
   (`tabledata._fields_raw_from_schema`) keeps the nested fields; the write path is pointed at
   the same function. Nothing else of the emulator is changed.

Arguments are bqemulator's own, e.g.
`start --rest-host 127.0.0.1 --rest-port 9050 --grpc-host 127.0.0.1 --grpc-port 9060 --project p`.
"""
import sys

import bqemulator.storage.engine as engine

engine.DuckDBEngine._load_spatial = lambda self: None

import bqemulator.grpc_api.write_servicer as write_servicer  # noqa: E402
from bqemulator.api.routes.tabledata import (  # noqa: E402
    _build_arrow_schema,
    _fields_raw_from_schema,
)

write_servicer._table_arrow_schema = lambda meta: _build_arrow_schema(
    _fields_raw_from_schema(meta.schema_.fields)
)

from bqemulator.cli import main  # noqa: E402  (after the patches)

sys.exit(main())
